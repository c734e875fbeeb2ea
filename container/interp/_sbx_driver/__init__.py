"""sbx's Python code-interpreter driver; ../driver.py is its entry point and
documents the protocol.  Imported only by driver.py, before the driver takes
its directory off sys.path (user code imports from the context's cwd); the
leading underscore keeps the already-imported package out of user code's way.
"""
