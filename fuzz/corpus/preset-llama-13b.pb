


	llama-13b

layers