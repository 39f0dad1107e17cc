"""The truth harness (issue 37): cl-mcp's answers on real libraries,
each checked against an oracle computed without cl-mcp.  `make truth`
runs it over the whole corpus (run.py); test_truth runs a subset."""
