"""Measurement commands (`python -m benchmarks.NAME`); see README.md. Not shipped, never imported by app, engine or ui."""
