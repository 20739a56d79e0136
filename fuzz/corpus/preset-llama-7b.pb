


llama-7b

layers