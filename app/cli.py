"""SABRE entry point."""
def main() -> None:
    """Run the SABRE command line."""

