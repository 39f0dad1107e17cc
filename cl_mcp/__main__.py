from cl_mcp.cli import main

raise SystemExit(main())
