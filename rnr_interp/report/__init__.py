"""HTML reports of run folders and the figures in them: the report owns every figure.

Submodules are imported on use (plotly is slow to import): `report.registry` maps each
run table to the function that draws it (`figures` for audit and routing,
`repair_figures`, `compare_figures`), `report.html` writes the page, `report.export`
writes static images.
"""
