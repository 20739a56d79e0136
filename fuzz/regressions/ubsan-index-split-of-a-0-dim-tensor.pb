


w 

splitw5