"""The networks (each with its split beside it) and how they are compiled."""
