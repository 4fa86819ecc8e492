"""Output for people: rich tables (the only place numbers get units) and plotly figures."""
