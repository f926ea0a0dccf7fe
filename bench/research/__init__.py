"""Research experiments: model quality against baselines, ablations, the oracle and scaling."""
