"""The commands besides training: eval, bench, doctor."""
