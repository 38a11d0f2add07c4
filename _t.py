import tfbnn.training as training
r = training.get_recipe("digits-bbb-mlp").replace(name="ens", method="ensemble", method_options={"members": 3, "member_method": "bbb", "estimator": "flipout"}).quick()
res = training.run(r, output_dir="/tmp/ens/run1", verbose=0)
print(res.test)
print(res.files)
print(res.history[:3])
