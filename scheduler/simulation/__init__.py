"""Replay a demand trace on a fleet under several allocation strategies."""
