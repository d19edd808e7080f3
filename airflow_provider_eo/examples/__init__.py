"""Example transforms and pipelines used by the demo, the example DAGs and the README."""
