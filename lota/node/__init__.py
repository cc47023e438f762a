"""The node: its listener, its front end and the composition root that builds it."""
