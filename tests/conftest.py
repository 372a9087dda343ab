"""The suite runs as a terminal's foreground job would, whoever starts it.

A job started in the background by a non-interactive shell (`make test &`, a CI runner's
`nohup`) inherits SIGINT and SIGHUP ignored, and so would every process the tests start: the
commands under test rightly keep an inherited ignored signal ignored, so the tests of Ctrl-C and
hangup would see nothing happen. Here both get their default action back before any test runs
(a Python handler for SIGINT, which exec resets to the default in the processes started); the
test of an inherited ignored SIGINT sets it ignored in its own child.
"""

import signal

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
