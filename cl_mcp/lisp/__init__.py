"""The Lisp side, in Python: the session the tools talk to, the link to an
image (owned or shared), the SBCL process, the Swank client, and the news of
the user's threads."""
