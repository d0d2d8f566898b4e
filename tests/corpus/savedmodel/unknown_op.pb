µ
"serve*2.99.0O
.
xPlaceholder*
dtype0*
shape:

yFrobnicateOpx*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict