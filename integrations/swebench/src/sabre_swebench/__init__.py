"""A SWE-bench runner driving SABRE over HTTP (``sabre-swe``, also ``sabre swe``)."""
