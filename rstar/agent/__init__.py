"""The interaction format and the agent loop every path runs; its verl adapter."""
