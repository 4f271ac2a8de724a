"""The errors a user can fix: each is printed as one line that names the problem and the fix, never a traceback.

Every command catches UserError, prints `error: <message>` and exits with exit_code(e): 3 for a run that diverged,
130 for a second Ctrl-C, 2 for anything else. Under mpiexec an error every rank meets alike is printed once; one a
rank may meet alone (everywhere = False) aborts the job (minigpt/distributed.py, exit_status).
This module imports nothing of the project, so any module may raise these.
"""


class UserError(Exception):
    """A problem with the user's input or surroundings (a setting, a file, the disk), worded with its fix."""
    everywhere = True                          # under mpiexec every rank meets it alike


class Diverged(UserError):
    """The loss or gradient norm stopped being finite."""


class OutOfMemory(UserError):
    """numpy or the C library could not allocate an array of the model, its optimizer state or a step's activations
    (or the C library a buffer of its own)."""
    everywhere = False                          # under mpiexec a rank may meet it alone


class StoppedTwice(UserError):
    """A second SIGINT/SIGTERM before the step finished: stop at once, without saving."""
    everywhere = False


class CannotSave(UserError):
    """A checkpoint or snapshot could not be written (a full disk, a directory made read-only)."""
    everywhere = False                          # rank 0 alone writes


def exit_code(e):
    """The command's exit status for a UserError: 3 diverged, 130 stopped by a second signal, else 2."""
    return 3 if isinstance(e, Diverged) else 130 if isinstance(e, StoppedTwice) else 2
