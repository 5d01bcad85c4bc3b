"""What a training rank's exit says to the process that launched it (xylent.launch), beyond a crash."""

# the run's loss went non-finite: the settings' doing, not a fault to resume from; the rank prints one
# line starting with DIVERGED_MARK that says where and with what settings, and exits with DIVERGED
DIVERGED = 65
DIVERGED_MARK = "xylent: stopped:"
