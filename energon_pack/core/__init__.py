"""Types and small helpers every layer shares: conversations and samples, visual payloads,
alignment, tables, the cache folder, stage timers and Energon workarounds.

Nothing here imports another energon_pack folder except ``errors``.
"""
