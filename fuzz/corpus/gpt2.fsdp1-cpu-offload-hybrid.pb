
$
"

gpt2-small

layers
seq€’
˜Ð