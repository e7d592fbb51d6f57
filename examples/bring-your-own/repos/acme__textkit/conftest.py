# Makes the repository root importable for the tests (pytest puts this file's directory on sys.path).
