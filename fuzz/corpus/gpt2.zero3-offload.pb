
$
"

gpt2-small

layers
seq€’
	ˆÈ