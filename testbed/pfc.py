"""The old import path of fabric.switch_control, for the run pipeline's modules that still
import from it (testbed.run, testbed.remote); nothing else imports this."""

from fabric.switch_control import SwitchController, controller_running

pfc_running = controller_running
PfcController = SwitchController

__all__ = ["PfcController", "pfc_running"]
