"""Allocator models: replay a target's event stream into the figures an allocator would report."""
