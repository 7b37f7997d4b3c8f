"""The one base class of the errors a user can fix: bad input files, flags, databases, or an
environment without what a command needs.

The CLI shows each as one line ("Error: ..."). It catches this base instead of every module's
own class so that catching costs no import: importing the modules that raise them would pull
in torch and triton before `--backend interpret` could set TRITON_INTERPRET.
"""


class UserError(Exception):
    """Something the user can fix; its message names what is wrong and where."""


class UsageError(UserError):
    """Options or arguments that do not go together, found only once their files were read
    (two --space files for one kernel): the CLI exits 2, as for any usage error."""
