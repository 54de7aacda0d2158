"""The Hugging Face Hub: the model card rendered from a model folder's own files (`model_card`), and the checked
upload folder and its upload (`upload`)."""
