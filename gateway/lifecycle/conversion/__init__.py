"""The sandboxed conversion workers: parent side, child, what they exchange, what a
worker may do."""
