"""The SlurmCluster operator (kopf). See README.md in this folder."""
