"""Raw primitives. Only the recipe that owns a primitive imports it.

Nothing here is safe to use on its own: no input validation beyond types, no protocol
context. Use the recipes in :mod:`clinograph.secure` instead.
"""
