"""Renderers: terminal text and JSON."""
