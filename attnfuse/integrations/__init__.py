"""Integrations of AttnFuse with other libraries (each imports its library on use)."""
