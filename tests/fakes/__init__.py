"""In-process fakes of gazette services for unit tests."""
