"""The framework-neutral training loop, its observers and what it records."""
