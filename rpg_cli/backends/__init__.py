"""The backends: each one package (verl/, local/) whose `launch` module gives the interface the registry declares,
and its line in the registry (registry.py: `BACKENDS`, `backend_names`, `get`). Backends never import each other;
everything above reaches one through the registry, by the name a spec or an option gives.

Importing this package imports nothing (the spec reads the registry's names at validation time)."""
