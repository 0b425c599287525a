"""The analyses layer: each analysis writes a run folder (records, tables, summary.json).
`audit` (realized vs reachable), `routing/` (layer routes and searches), `localise/`
(recognised-but-not-generated failures: silencing, steering, units), `checkpoints`
(base vs trained), `sweep` (grids of audits, the temperature sweep)."""
