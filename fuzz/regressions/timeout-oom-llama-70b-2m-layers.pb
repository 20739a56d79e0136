


	llama-70b
layers•€€