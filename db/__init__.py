"""Persistence: every trial, study and winner, in SQLite by default or any SQLAlchemy URL."""
