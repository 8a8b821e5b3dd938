"""Scripts that run in a peer's own interpreter (its libraries, not EBRL's), started by launch tools."""
