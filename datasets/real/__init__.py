"""Real datasets in their public layouts (MS-SL feature release, TVRetrieval / XML)."""
