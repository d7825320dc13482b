"""What every layer of raystream shares: the base of its errors, and failpoints.

The lowest layer (``docs/architecture.md``): it imports nothing of raystream.
"""
