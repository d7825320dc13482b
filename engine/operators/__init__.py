"""Built-in operators."""
