"""What every layer of raystream shares: the base of its errors, failpoints, starting Ray
and how much Ray and Spark print.

The lowest layer (``docs/architecture.md``): it imports nothing of raystream.
"""
