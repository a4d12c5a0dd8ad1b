"""rstar: agentic RL for math reasoning (rStar2-Agent), as a pipeline people can run."""

# Part of every stage's cache key: bump it when a change alters what a stage produces.
__version__ = "0.22.0"
