


gpt2-xl

layers