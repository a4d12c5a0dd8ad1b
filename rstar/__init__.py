"""rstar: agentic RL for math reasoning (rStar2-Agent), as a pipeline people can run."""
__version__ = "0.1.0"
