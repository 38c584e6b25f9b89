"""Plain, obviously correct implementations written from the papers: the test oracle."""
