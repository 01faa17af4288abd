"""The old import path of fabric.pause_receiver, for testbed.remote, which still imports
`receiving` from it; nothing else imports this."""

from fabric.pause_receiver import receiving

__all__ = ["receiving"]
