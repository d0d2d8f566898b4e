«
"train*2.99.0K
.
xPlaceholder*
dtype0*
shape:

yIdentityx*
T0*K
serving_default8

x
x:0
y
y:0tensorflow/serving/predict