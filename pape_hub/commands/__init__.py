"""Command implementations shared by ``pape-hub <command>`` and ``scripts/<command>.py``."""
