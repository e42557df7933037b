"""What the ranks load, shared by the model-data step: the copy to the worker, the Hugging Face download's settings,
the weight files and the ABLIT pack (each a group of operations model_data composes)."""
