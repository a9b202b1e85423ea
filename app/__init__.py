"""moelab's Streamlit visualizer: timelines, measured-vs-simulated, the fence story and routing.

`moelab app` starts it (app/cli.py). The modules below the pages never import streamlit, so the
lane layout, the aggregation and the figures are testable and reusable without a server:
lanes.py (trace -> Gantt rows and bars), charts.py (plotly and matplotlib figures),
compare_data.py (the measured runs the Compare page offers; the comparison is sim.compare), golden_data.py (routing
tables of a config). forms.py, downloads.py, main.py and views/ (one script per page) are the Streamlit side.
"""
