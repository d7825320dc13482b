"""Spark integration: sessions through RayDP, reading committed output."""
