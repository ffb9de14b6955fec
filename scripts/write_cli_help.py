"""Write ``pape_hub/commands/help.json``: every command's ``--help`` as its parser renders it, which
``pape-hub COMMAND --help`` prints without importing the package (run after changing a flag; the test suite
checks the file is current)."""

from pape_hub_cli import write_help_cache

if __name__ == "__main__":
    print(f"wrote {write_help_cache()}")
