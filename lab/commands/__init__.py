"""The lab's commands (``python -m lab COMMAND``), each a module with ``add_arguments(parser)`` and ``run(args)``."""
