"""Scale experiments: TPU pod plans and the data pipeline at BooksCorpus size."""
